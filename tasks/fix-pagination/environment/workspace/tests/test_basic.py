from pager import get_page


def test_first_page():
    assert get_page(list(range(10)), 1, 4) == [0, 1, 2, 3]
