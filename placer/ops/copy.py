"""Op family 'copy' (filled in by its module owner)."""
