"""`tinkrl view`: a local web page over run and eval directories (curves, episodes, evals), live."""
