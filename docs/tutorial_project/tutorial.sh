#!/usr/bin/env bash
# Every command of the tutorial, in order; tests/test_tutorial.py runs this file.
set -euo pipefail

# [migrate]
python manage.py makemigrations shop
python manage.py migrate
python manage.py check
# [/migrate]

# [flush]
python manage.py shell -c "
from shop.models import Organization
from shop.services import rename

acme = Organization.objects.create(name='Acme')
rename(acme, 'Acme Corporation')
"
# [/flush]

# [drain]
python manage.py shell -c "
from shop.models import Organization
from shop.services import rename

acme = Organization.objects.get(name='Acme Corporation')
rename(acme, 'Acme Inc.', flush=False)
rename(acme, 'Acme Ltd.', flush=False)
"
python manage.py outbox_status
python manage.py drain_outboxes
# [/drain]

# [test]
python -m pytest
python manage.py test
# [/test]
