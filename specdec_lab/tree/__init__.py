"""Token trees: several candidates per step, verified in one target forward (docs/design.md, "Token trees")."""
from .structure import Tree, ancestors, positions, static_parents, tree_mask, tree_mask_reference, tree_size  # noqa: F401
from .rules import RULES, verify_tree, verify_tree_reference  # noqa: F401
from .draft import DynamicTree, TreeDrafter  # noqa: F401
from .auto import Plan, choose, plan  # noqa: F401
from .engine import TreeEngine  # noqa: F401
