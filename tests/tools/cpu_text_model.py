"""The bundled recipe etc/recipes/cpu-text.yaml modelled in plain Python,
for the end-to-end tests on the real Data-Juicer (real_daemon.sh, demo.sh):
whitespace normalised (every blank but a newline becomes a space, ends
stripped), links and e-mail addresses removed, a sentence (ended by . ! ?
。！？, or by a closing quote after one) repeated within a record kept once
(compared on its ASCII letters, digits, CJK ideographs and spaces, when at
least 2 of them), texts shorter than 20 characters dropped."""
import re

ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufffc"
LINK = re.compile(r"(?i)\b(?:(?:https?|ftp)://|www\d{0,3}\.)[^\s()<>]*[^\s`!()\[\]{};:'\".,<>?«»“”‘’]")
EMAIL = re.compile(r"[A-Za-z0-9.+_-]+@[A-Za-z0-9.+_-]+\.[A-Za-z]+")
SENTENCE_END = re.compile(r"(?:(?<=[.!?。！？])|(?<=[.!?。！？][’”]))(?=[^’”])")


def recipe(t):
    """The text the recipe makes of t, or None if it drops the record."""
    t = "".join(" " if (c.isspace() and c != "\n") or c in ZERO_WIDTH else c for c in t.strip())
    t = LINK.sub("", t)
    t = EMAIL.sub("", t)
    seen, lines = set(), []
    for line in t.split("\n"):
        kept = ""
        for s in SENTENCE_END.split(line) if line else []:
            key = re.sub(r"[^0-9A-Za-z\u4e00-\u9fa5\t ]", "", s.strip())
            if len(key) < 2 or key not in seen:
                kept += s
                seen.add(key)
        lines.append(kept)
    t = "\n".join(lines)
    return t if len(t) >= 20 else None
