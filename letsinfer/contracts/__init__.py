"""What the main and its agents say to each other, and nothing else: the signed
facts envelope (facts.py), the desired-placement record and its wire form
(placement.py), model artifacts by digest (artifacts.py) and a child's work
before a move (work.py). Both sides import these; neither imports the other's
code for them, so a child runs none of the main's authority."""
