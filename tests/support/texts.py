"""Deterministic test texts for embedding engines: the shapes of input real pipelines see."""

from __future__ import annotations

import random

_WORDS = ("the quick brown fox jumps over lazy dog battery screen delivery refund great terrible ok "
          "shipping arrived broken works perfectly would buy again não recomendo très bien größe "
          "naïve café señor 東京 製品 很好 质量 좋아요 ★★★★☆ 👍 🔥 😡 ½ 3.5mm USB-C 100% #1").split()


def varied_texts(num_texts: int = 200, seed: int = 7) -> list[str]:
    """Texts of 0 to 400 words: the empty string, whitespace, accents, CJK, emoji; every 40th is 300+ words.

    Skewed short, like reviews; the long ones exceed 256 tokens, so they exercise truncation.
    """
    rng = random.Random(seed)
    texts = ["", "ok", "👍", "東京タワーはとても高いです。", "   spaced   out\n\tlines  ", "Ünïcödé ÀÉÎÕÜ ß"]
    while len(texts) < num_texts:
        num_words = rng.choice([320, 400]) if len(texts) % 40 == 0 else rng.choice([1, 2, 3, 5, 8, 13, 21, 40, 60])
        text = " ".join(rng.choice(_WORDS) for _ in range(num_words))
        texts.append(text.capitalize() + rng.choice([".", "!", "?", "", " 🎉"]))
    return texts[:num_texts]
