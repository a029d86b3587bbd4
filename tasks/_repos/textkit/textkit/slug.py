"""URL slugs."""

import re


def slugify(text: str, max_len: int = 40) -> str:
    """Lower-case words joined by '-', only [a-z0-9]; no leading/trailing/double '-'; cut at max_len."""
    slug = re.sub(r"[^a-z0-9]", "-", text.lower())
    return slug[:max_len]
