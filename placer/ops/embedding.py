"""Op family 'embedding' (filled in by its module owner)."""
