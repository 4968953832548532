"""Pictures: the daemon's page and the HTML of reports and history (docs/pictures.md)."""
