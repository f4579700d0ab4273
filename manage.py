#!/usr/bin/env python
"""The project's management commands (``python manage.py migrate``); the installed ``outlier-admin``
runs the same function (:func:`outlier_admin.cli.main`)."""
from outlier_admin.cli import main

if __name__ == "__main__":
    main()
