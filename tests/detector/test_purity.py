import subprocess
import sys


def test_importing_detector_pulls_in_no_django_redis_or_celery():
    code = (
        "import sys, detector, detector.group, detector.picking;"
        "bad = [m for m in ('django', 'redis', 'celery', 'psycopg', 'rest_framework') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
