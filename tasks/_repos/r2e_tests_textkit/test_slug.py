from textkit import slugify


def test_simple():
    assert slugify("Hello World") == "hello-world"


def test_punctuation_collapses():
    assert slugify("  Rock & Roll!! ") == "rock-roll"


def test_cut_has_no_trailing_dash():
    assert slugify("aaaa bbbb", max_len=5) == "aaaa"


def test_already_slug():
    assert slugify("abc-123") == "abc-123"


class TestUnicode:
    def test_accents_dropped(self):
        assert slugify("café au lait") == "caf-au-lait"
