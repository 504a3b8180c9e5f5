"""The validated configuration: fields and flags (fields), the shared and objective configs
(base), files and upstream args files (loader, upstream), and push settings (push).

May import storage and the bottom layer."""
