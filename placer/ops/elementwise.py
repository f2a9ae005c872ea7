"""Op family 'elementwise' (filled in by its module owner)."""
