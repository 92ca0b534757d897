"""Logs: entry format, wire protocol, agent client, writer and reader."""
