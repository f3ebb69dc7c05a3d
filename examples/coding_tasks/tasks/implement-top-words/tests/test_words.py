import sys

sys.path.insert(0, ".")
from words import top_words

text = "The cat and the hat. A cat, a bat; THE end!"
assert top_words(text, 3) == [("the", 3), ("a", 2), ("cat", 2)], top_words(text, 3)
assert top_words(text, 1) == [("the", 3)]
assert top_words("", 2) == []
print("ok")
