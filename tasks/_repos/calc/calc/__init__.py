from calc.ops import add, divide, mean

__all__ = ["add", "divide", "mean"]
