"""Reports: read DVC experiments, compare them control by control, render Markdown, HTML and charts."""
