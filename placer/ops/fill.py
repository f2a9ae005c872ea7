"""Op family 'fill' (filled in by its module owner)."""
