"""A held-out prompt set written by hand, in styles the project's templates never produce.

Every training prompt the project makes comes from templates (prompts.py) or from the
target itself (magpie.py); a draft can learn the templates' shapes instead of the target.
These prompts measure agreement where nobody tuned for: everyday explanations, poems,
e-mails and letters, code in several languages, SQL, translations, list edits, short
factual questions, role-play, summaries of a given paragraph, advice, planning.

They are kept out of every training run: `is_held_out_text` matches them exactly and as
near-duplicates, `magpie.synthesize_prompts` drops any synthesized prompt it matches,
`data.generate_data` drops them from whatever prompts it is given, and a test checks every
template source against them.
"""
import functools
import re

# (kind, prompt). Kinds group the report; the order is fixed so that runs compare.
HANDWRITTEN = [
    ("explain", "My bread never rises properly. What could I be doing wrong?"),
    ("explain", "How does a dishwasher get plates clean without anyone scrubbing them?"),
    ("explain", "Why do my ears pop when a plane starts to land?"),
    ("explain", "What actually happens inside a phone charger when I plug it in?"),
    ("explain", "Is it true that we only use ten percent of our brains?"),
    ("explain", "Why does a spoon look bent when it stands in a glass of water?"),
    ("explain", "What's the point of a credit score, and how do I check mine?"),
    ("explain", "Why are there leap years?"),
    ("poem", "Compose a haiku about the first frost on a car windshield."),
    ("poem", "Write a four-line rhyming poem for my grandmother's eightieth birthday."),
    ("poem", "I need a limerick about a cat who refuses to leave the bathtub."),
    ("poem", "Write a short free-verse poem about waiting for a bus in the rain."),
    ("poem", "Give me a haiku sequence, three haiku, following one day at the beach."),
    ("email", "Draft an email to my landlord telling him the kitchen tap has been leaking for a week."),
    ("email", "Write a polite email declining a job offer because I accepted another one."),
    ("email", "Help me write a message to my team saying the Friday meeting is cancelled."),
    ("email", "Write a letter to my future self, to be opened in ten years."),
    ("email", "Compose a short apology to a friend whose birthday party I missed."),
    ("email", "Write a cover email for sending my CV to a bookshop that is hiring."),
    ("code", "Write a Rust function that returns the largest value in a slice of i32."),
    ("code", "In Go, how do I read a text file line by line?"),
    ("code", "Show me a TypeScript interface for a blog post with a title, an author and tags."),
    ("code", "Write a Java method that checks whether a string contains only digits."),
    ("code", "Give me a C++ program that prints the multiplication table of 7."),
    ("code", "How do I center a div horizontally and vertically with CSS?"),
    ("code", "Write a shell one-liner that finds the ten largest files under the current directory."),
    ("code", "Fix this Python code: for i in range(10) print(i)"),
    ("code", "What does this regular expression match: ^[A-Z][a-z]+$ ?"),
    ("code", "Write a Ruby method that turns a sentence into snake_case."),
    ("sql", "Write a SQL query that finds the three most expensive products in a products table."),
    ("sql", "Given tables orders(id, customer_id, total) and customers(id, name), write SQL that "
            "lists each customer's name with the sum of their orders."),
    ("sql", "How do I delete duplicate rows from a SQL table but keep one copy of each?"),
    ("sql", "Write a SQL statement that creates a table for library books with an id, a title, "
            "an author and a year."),
    ("translate", "Translate into French: Where is the nearest train station?"),
    ("translate", "How do you say 'thank you very much for your help' in Spanish?"),
    ("translate", "Translate this German sentence into English: Ich habe heute keine Zeit."),
    ("translate", "Put 'The museum is closed on Mondays' into Italian."),
    ("translate", "What does the Japanese word 'arigatou' mean?"),
    ("list", "Here is my shopping list: eggs, flour, sugar, milk. Add butter and remove sugar."),
    ("list", "Put these in the order they happened: the Moon landing, World War One, the invention "
             "of the telephone."),
    ("list", "Turn this into a numbered to-do list: call the bank, water the plants, book a dentist "
             "appointment."),
    ("list", "Which of these are mammals: whale, shark, bat, penguin, dolphin?"),
    ("list", "Group these foods into fruits and vegetables: carrot, strawberry, spinach, banana, potato."),
    ("fact", "How many bones are in the adult human body?"),
    ("fact", "Who painted the Mona Lisa?"),
    ("fact", "What is the boiling point of water at the top of Mount Everest?"),
    ("fact", "How far away is the Moon?"),
    ("fact", "Which planet has the most moons?"),
    ("fact", "When did the Berlin Wall fall?"),
    ("roleplay", "Pretend you are a pirate captain and welcome me aboard your ship."),
    ("roleplay", "You are a tour guide in Rome. Tell me what we will see today."),
    ("roleplay", "Act as a job interviewer and ask me your first question for a barista position."),
    ("roleplay", "Be a medieval innkeeper and tell me what is on the menu tonight."),
    ("summary", "Summarise in two sentences: Our neighbourhood garden started three years ago on "
                "an empty lot. Volunteers built raised beds, a tool shed and a rain barrel. This "
                "year it produced enough tomatoes to give some to the food bank."),
    ("summary", "Give me the gist of this: The software update adds a dark mode, fixes a bug that "
                "drained the battery overnight, and removes the old photo editor, which few people used."),
    ("summary", "TL;DR please: The hiking trail will be closed from June to August while workers "
                "replace two wooden bridges. A detour through the forest road adds about two "
                "kilometres."),
    ("summary", "What are the key points here? Sales rose in the spring, fell sharply in July when "
                "the factory flooded, and recovered by October after production moved to a second site."),
    ("advice", "I have an exam in three days and have not started studying. Help me make a plan."),
    ("advice", "My houseplant's leaves are turning yellow. What should I check first?"),
    ("advice", "What should I say when I call in sick to work?"),
    ("advice", "Suggest a name for a small bakery that sells mostly cinnamon rolls."),
    ("advice", "How should I split the rent fairly when my room is bigger than my flatmate's?"),
    ("plan", "Plan a vegetarian dinner for six people on a small budget."),
    ("plan", "Make me a packing checklist for a week of skiing."),
    ("plan", "Give me a weekly schedule for learning to juggle in a month."),
    ("writing", "Write the opening sentence of a mystery novel set on a night train."),
    ("writing", "Describe the smell of a bakery early in the morning in three sentences."),
    ("writing", "Write a product description for a reusable bamboo toothbrush."),
    ("writing", "Write a toast for my brother's wedding, short and a little funny."),
    ("math", "If I walk at five kilometres an hour, how long does it take to walk twelve kilometres?"),
    ("math", "What is 15 percent of 240?"),
    ("math", "A recipe for four people needs 300 grams of rice. How much do I need for seven?"),
]

HANDWRITTEN_PROMPTS = [p for _, p in HANDWRITTEN]
HANDWRITTEN_KINDS = [k for k, _ in HANDWRITTEN]


# ----------------------------------------------------------------------------- matching

def normalize(text: str) -> str:
    """Lower case, letters and digits only, single spaces: what exact duplicates share."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def word_ngrams(text: str, n: int = 3) -> set:
    """The set of n-word shingles of the normalised text (the whole text when shorter)."""
    words = normalize(text).split()
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def ngram_overlap(a: set, b: set) -> float:
    """Jaccard similarity |a & b| / |a | b| of two shingle sets (0 when both are empty)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


class NearDuplicateIndex:
    """Texts seen so far; `match(text)` says whether a new one repeats one of them, exactly (after
    `normalize`) or nearly (word 3-gram Jaccard >= `threshold`). An inverted index from shingles
    to texts keeps the check to the texts that share a shingle."""

    def __init__(self, texts=(), threshold: float = 0.5, n: int = 3):
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
        self.threshold, self.n = threshold, n
        self.exact, self.shingles, self.by_shingle = set(), [], {}
        for t in texts:
            self.add(t)

    def match(self, text: str) -> str | None:
        """'exact', 'near' or None."""
        if normalize(text) in self.exact:
            return "exact"
        s = word_ngrams(text, self.n)
        candidates = {i for g in s for i in self.by_shingle.get(g, ())}
        if any(ngram_overlap(s, self.shingles[i]) >= self.threshold for i in candidates):
            return "near"
        return None

    def add(self, text: str) -> None:
        self.exact.add(normalize(text))
        s = word_ngrams(text, self.n)
        for g in s:
            self.by_shingle.setdefault(g, []).append(len(self.shingles))
        self.shingles.append(s)


@functools.cache
def held_out_index() -> NearDuplicateIndex:
    """The hand-written prompts, indexed once per process (the list is a constant)."""
    return NearDuplicateIndex(HANDWRITTEN_PROMPTS)


def is_held_out_text(text: str) -> bool:
    """True when `text` is one of the hand-written prompts, exactly or as a near-duplicate."""
    return held_out_index().match(text) is not None


def drop_held_out(prompts: list[str]) -> list[str]:
    """`prompts` without any that match the hand-written held-out set (text prompts only)."""
    return [p for p in prompts if not (isinstance(p, str) and is_held_out_text(p))]
