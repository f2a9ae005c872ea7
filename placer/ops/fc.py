"""Op family 'fc' (filled in by its module owner)."""
