"""The target's web pages (the dashboard and the simulator): HTML, JS and CSS served by
``node.target.http.pages`` from this package's files."""
