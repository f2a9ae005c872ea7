"""Op family 'loss' (filled in by its module owner)."""
