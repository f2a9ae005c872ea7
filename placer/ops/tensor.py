"""Op family 'tensor' (filled in by its module owner)."""
