"""Reading the agents' Prometheus metrics: scraping and parsing (``scrape``) and turning two
scrapes into rates, latencies and lag (``rates``). Used by ``dlctl top``; Prometheus itself reads
the same endpoints (deploy/prometheus)."""
