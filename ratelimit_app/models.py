"""Every model of the app, where Django and users look for them (``ratelimit_app.models``).

Each lives with its concern: the quota configuration and its audit trail in ``config/models.py``,
alerts and webhooks in ``business/alerts/models.py``, usage records in
``business/usage/models.py``, prepaid credits in ``business/credits/models.py``, the
dashboard's table-less model in ``metrics/models.py``. The app label and the model names are
those of the first release, so no migration moved.
"""

from .business.alerts.models import *  # noqa: F403
from .business.alerts.models import __all__ as _alerts
from .business.credits.models import *  # noqa: F403
from .business.credits.models import __all__ as _credits
from .business.usage.models import *  # noqa: F403
from .business.usage.models import __all__ as _usage
from .config.models import *  # noqa: F403
from .config.models import __all__ as _config
from .metrics.models import *  # noqa: F403
from .metrics.models import __all__ as _metrics

__all__ = [*_config, *_alerts, *_usage, *_credits, *_metrics]
