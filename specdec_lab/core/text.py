"""Prompts to token ids: text gets the chat template of instruct models, ids pass through."""
import torch


def encode_prompt(tokenizer, prompt) -> list[int]:
    """A text prompt (chat template applied when the tokenizer has one) or token ids -> list of ids."""
    if isinstance(prompt, torch.Tensor):
        prompt = prompt.flatten().tolist()
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("prompt must not be empty")
        if tokenizer is None:
            raise ValueError("prompt is text but no tokenizer was given; pass token ids instead")
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if not isinstance(ids, list) else ids
            return list(ids)
        return tokenizer.encode(prompt)
    if isinstance(prompt, (list, tuple)):
        if len(prompt) == 0:
            raise ValueError("prompt must not be empty")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise ValueError("prompt must be a string or a list of int token ids")
        return list(prompt)
    raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
