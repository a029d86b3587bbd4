from calc import add, divide, mean


def test_add():
    assert add(2, 3) == 5


def test_divide():
    assert divide(6, 3) == 2


def test_mean():
    assert mean([1, 2, 3]) == 2
