"""Split a list of items into fixed-size pages (pages are numbered from 1)."""


def page_count(n_items: int, per_page: int) -> int:
    """How many pages `n_items` fill; a partial last page counts. 0 items -> 0 pages."""
    return n_items // per_page


def get_page(items: list, page: int, per_page: int) -> list:
    """The items on page `page` (1-based); a page past the end is empty."""
    if page > page_count(len(items), per_page):
        raise IndexError(page)
    start = (page - 1) * per_page
    return items[start : start + per_page]
