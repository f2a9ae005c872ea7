"""The cluster runtime on Ray: the driver, one actor per worker, the ``placer run --ray`` command."""
