"""Where the suite's files are: the tests folder (its helper modules and workers), its fixtures, the checkout."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"  # files written by earlier tokenmix versions, and small files in older layouts
ROOT = TESTS.parent
