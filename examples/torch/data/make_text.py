"""Writes play.txt, the character-level corpus of gpt.py: a generated "play", not a real text.

A small grammar, expanded with Python's `random.Random(seed)` (whose integer-seeded sequence is
stable across Python 3 versions), writes scenes of speeches in the layout of a play script:

    ACT I. SCENE 2.

    MARINA:
    The quiet river keeps the old bell, and the king remembers it.
    ...

It is English-like text with structure a small model can learn in a few hundred steps (names in
capitals followed by a colon, a small vocabulary, sentence shapes), written by this script and
therefore free of any copyright. The file is committed so that the examples need no download;
rerun `python make_text.py` to check it is reproduced byte for byte.
"""

import os
import random

SPEAKERS = ["MARINA", "OSWIN", "THE KING", "LADY CORA", "BRAND", "THE FOOL", "ELSPETH", "A SOLDIER"]
ADJECTIVES = ["quiet", "old", "bright", "cold", "golden", "broken", "gentle", "dark", "weary", "proud",
              "green", "silent", "young", "bitter", "faithful", "hollow", "swift", "pale"]
NOUNS = ["river", "bell", "king", "crown", "garden", "sword", "letter", "tower", "night", "sea", "horse",
         "daughter", "winter", "city", "lamp", "gate", "fire", "song", "road", "heart", "wind", "field"]
VERBS = ["keeps", "remembers", "carries", "breaks", "follows", "wakes", "hides", "calls", "burns",
         "finds", "loves", "fears", "guards", "forgets", "answers", "leaves"]
ADVERBS = ["slowly", "again", "tonight", "at last", "too soon", "in silence", "by morning", "once more"]
CONNECTIVES = ["and", "but", "for", "while", "though", "until"]
EXCLAMATIONS = ["O", "Alas", "Hark", "Peace", "Away", "Come", "Nay", "Look"]
QUESTIONS = ["Who", "Why", "Where", "When", "What"]
OPENINGS = ["I swear", "They say", "Tell me", "You know", "We shall see", "Mark me", "I think"]
DIRECTIONS = ["Enter {a} and {b}.", "Exit {a}.", "Exeunt.", "{a} kneels.", "Enter {a}, with a letter.",
              "Thunder. Enter {a}.", "{a} draws.", "Music. Exit {a}."]
ROMAN = ["I", "II", "III", "IV", "V"]


class Writer:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def pick(self, words):
        return self.r.choice(words)

    def noun_phrase(self):
        det = self.pick(["the", "the", "a", "my", "your", "his", "her", "our", "this"])
        if self.r.random() < 0.6:
            return f"{det} {self.pick(ADJECTIVES)} {self.pick(NOUNS)}"
        return f"{det} {self.pick(NOUNS)}"

    def clause(self):
        subject = self.noun_phrase() if self.r.random() < 0.7 else self.pick(["he", "she", "it", "the king"])
        text = f"{subject} {self.pick(VERBS)} {self.noun_phrase()}"
        if self.r.random() < 0.3:
            text += " " + self.pick(ADVERBS)
        return text

    def sentence(self):
        kind = self.r.random()
        if kind < 0.15:
            return f"{self.pick(QUESTIONS)} {self.pick(['does', 'did', 'will'])} {self.noun_phrase()} " \
                   f"{self.pick(['sleep', 'weep', 'wait', 'burn', 'sing', 'fall', 'return'])}?"
        if kind < 0.3:
            return f"{self.pick(EXCLAMATIONS)}, {self.clause()}!"
        if kind < 0.45:
            return f"{self.pick(OPENINGS)} {self.clause()}."
        text = self.clause()
        if self.r.random() < 0.5:
            text += f", {self.pick(CONNECTIVES)} {self.clause()}"
        return text[0].upper() + text[1:] + "."

    def speech(self, speaker):
        lines = [f"{speaker}:"]
        for _ in range(self.r.randint(1, 4)):
            lines.append(self.sentence())
        return "\n".join(lines) + "\n"

    def scene(self, act, number):
        cast = self.r.sample(SPEAKERS, self.r.randint(2, 4))
        a, b = (name.title() for name in cast[:2])
        parts = [f"ACT {act}. SCENE {number}.\n", self.pick(DIRECTIONS).format(a=a, b=b) + "\n"]
        for _ in range(self.r.randint(6, 14)):
            parts.append(self.speech(self.pick(cast)))
        parts.append("Exeunt.\n")
        return "\n".join(parts)

    def play(self, size):
        parts = ["THE GENERATED PLAY\n", "A text written by examples/torch/data/make_text.py.\n"]
        scenes, total = 0, 0
        while total < size:  # four scenes an act, five acts, then from act I again
            part = self.scene(ROMAN[scenes // 4 % len(ROMAN)], scenes % 4 + 1)
            scenes += 1
            parts.append(part)
            total += len(part) + 1
        return "\n".join(parts)


def main():
    text = Writer(seed=23).play(size=100_000)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "play.txt")
    with open(path, "w", encoding="ascii") as f:
        f.write(text)
    print(f"{path}: {len(text)} characters, {len(set(text))} distinct")


if __name__ == "__main__":
    main()
