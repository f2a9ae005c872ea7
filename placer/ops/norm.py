"""Op family 'norm' (filled in by its module owner)."""
