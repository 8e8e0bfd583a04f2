"""The report: the page, its rows and figures, and the audit of what it publishes."""
