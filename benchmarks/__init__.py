"""Side-by-side benchmark of maskserve, the seed's design and the offline pipeline (issue 6)."""
