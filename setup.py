"""The wheel's packages: ``contract*`` (what the control plane and the gateways share), ``agent*``
(the gateway agent, ``outlier-agent``), ``detector*``, ``outlier_admin*`` and ``sim*`` (the demo,
``outlier_admin.demo``, runs the simulator), plus the top-level ``templates/``
shipped as ``outlier_admin/templates`` (pyproject.toml cannot map a directory onto a subpackage
next to a ``find``). A source checkout keeps the templates at the top; settings looks in both.
Everything else about the project is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

TEMPLATE_PACKAGES = ["outlier_admin.templates"] + [
    f"outlier_admin.templates.{name}" for name in find_namespace_packages("templates")
]

setup(
    # Namespace discovery, as pyproject.toml's `find` did: data directories (static/, ingest/deploy/)
    # have no __init__.py.
    packages=find_namespace_packages(include=["contract*", "agent*", "detector*", "outlier_admin*", "sim*"]) + TEMPLATE_PACKAGES,
    package_dir={"outlier_admin.templates": "templates"},
)
