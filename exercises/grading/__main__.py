"""`python -m exercises.grading [package]`: the score of exercises/ (or of `package`), per chapter."""

import sys

from exercises.grading import format_score, score

print(format_score(score(*sys.argv[1:2])))
