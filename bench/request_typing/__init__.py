"""Request typing scored offline: the labelled set and the classifier with each embedder."""
