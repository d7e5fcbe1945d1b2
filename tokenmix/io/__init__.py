"""What tokenmix writes for people and for disks: files written whole or not at all, a failing disk as one
line (``files.py``), progress bars (``progress.py``) and plain-text tables (``table.py``). Below every other
package: it imports nothing of tokenmix but ``errors.py``."""
