"""Fleet view on Prometheus: scrape targets from the mesh file, recording and alerting rules,
and the site x site matrix read back from Prometheus's HTTP API (issue 15)."""
