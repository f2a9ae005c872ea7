"""Op family 'conv' (filled in by its module owner)."""
