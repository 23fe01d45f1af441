"""What the tool prints and writes: tables, JSON, plots, the generated kernel listing, and the trace readers
behind compare-trace."""
