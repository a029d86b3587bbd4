import pytest
from pager import get_page, page_count


@pytest.mark.parametrize("n,per,pages", [(0, 5, 0), (5, 5, 1), (6, 5, 2), (10, 3, 4), (1, 10, 1)])
def test_page_count(n, per, pages):
    assert page_count(n, per) == pages


def test_last_partial_page():
    assert get_page(list(range(10)), 4, 3) == [9]


def test_past_the_end_is_empty():
    assert get_page(list(range(10)), 5, 3) == []


def test_middle_page():
    assert get_page(list(range(10)), 2, 4) == [4, 5, 6, 7]
