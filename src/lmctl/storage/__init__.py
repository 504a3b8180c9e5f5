"""Where bytes live: path rules (paths), atomic directories and files (atomic), fsspec locations
and the remote cache (locations), and the Hub client (hub).

May import only the bottom layer (errors, console, metrics, distributed)."""
