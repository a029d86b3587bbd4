from textkit.slug import slugify

__all__ = ["slugify"]
