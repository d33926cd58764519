"""`jobcore ui`: the operators' web console — server-rendered pages over the same use
cases the commands call, for admin keys only, with nothing fetched from the internet.

- :mod:`~services.ui.app`: the app factory and its pages;
- :mod:`~services.ui.sessions`: sign-in sessions, CSRF tokens and the Origin check;
- :mod:`~services.ui.charts`: inline SVG sparklines;
- :mod:`~services.ui.timeline`: the job page's timeline section.
"""
