"""Op family 'pool' (filled in by its module owner)."""
