"""Small numeric helpers."""


def add(a: float, b: float) -> float:
    return a + b


def divide(a: float, b: float) -> float:
    """a / b; dividing by zero raises ValueError("division by zero")."""
    return a / b


def mean(values: list[float]) -> float:
    """The arithmetic mean; an empty list raises ValueError("mean of empty list")."""
    return sum(values) / len(values)
