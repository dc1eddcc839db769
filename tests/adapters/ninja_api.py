"""Two Django Ninja APIs for the Ninja tests (tests/adapters/test_ninja*.py): one throttled as a
whole, with sync and async operations behind each kind of Ninja authentication, and one whose
router and single operation are throttled, beside an operation QuotaMiddleware decides; each has
operations marked ``@ratelimit_exempt``.

Its callers sign in with ``X-User-Key: key-<username>`` (an APIKeyHeader, async for the async
operation), ``Authorization:
Bearer token-<username>`` (an HttpBearer), or a Django session; each auth returns the user.
"""

from django.contrib.auth import get_user_model
from ninja import NinjaAPI, Router
from ninja.openapi.docs import Swagger
from ninja.security import APIKeyHeader, HttpBearer, django_auth

from ratelimit_app.decorators import ratelimit_exempt
from ratelimit_app.ninja import QuotaThrottle, add_refusal_handler
from ratelimit_app.openapi.ninja import RateLimitedOpenAPI


def _user(username):
    return get_user_model().objects.filter(username=username).first()


class UserKey(APIKeyHeader):
    param_name = "X-User-Key"

    def authenticate(self, request, key):
        return _user(key.removeprefix("key-")) if key and key.startswith("key-") else None


class AsyncUserKey(APIKeyHeader):
    """UserKey for async operations (Ninja 1.2 calls a sync ``authenticate`` on the loop)."""

    param_name = "X-User-Key"

    async def authenticate(self, request, key):
        if not key or not key.startswith("key-"):
            return None
        return await get_user_model().objects.filter(username=key.removeprefix("key-")).afirst()


class UserBearer(HttpBearer):
    def authenticate(self, request, token):
        return _user(token.removeprefix("token-")) if token and token.startswith("token-") \
            else None


class DocumentedAPI(RateLimitedOpenAPI, NinjaAPI):
    """A NinjaAPI whose schema documents the limits (tests/openapi/)."""


# --- an API throttled as a whole ----------------------------------------------------------------

# /ninja/docs shows the x- fields too (tests/openapi/test_swagger_browser.py)
api = DocumentedAPI(urls_namespace="ninja", throttle=QuotaThrottle(),
                    docs=Swagger(settings={"showExtensions": True}))
add_refusal_handler(api)


@api.get("/items")
def list_items(request):
    return {"items": ["a", "b"]}


@api.post("/items")
def create_item(request):
    return {"created": True}


@api.get("/async-items")
async def list_items_async(request):
    return {"items": ["a", "b"]}


@api.get("/keyed", auth=UserKey())
def keyed(request):
    return {"user": request.auth.username}


@api.get("/async-keyed", auth=AsyncUserKey())
async def keyed_async(request):
    return {"user": request.auth.username}


@api.get("/bearer", auth=UserBearer())
def bearer(request):
    return {"user": request.auth.username}


@api.get("/session", auth=django_auth)
def session(request):
    return {"user": request.auth.username}


@api.get("/async-session", auth=django_auth)
async def session_async(request):
    return {"user": request.auth.username}


@api.get("/twice", throttle=[QuotaThrottle(), QuotaThrottle()])
def twice(request):
    return {"ok": True}


@api.get("/health", auth=UserKey())
@ratelimit_exempt
def health(request):
    return {"ok": True}


@ratelimit_exempt  # above Ninja's decorator works too
@api.get("/async-health", auth=AsyncUserKey())
async def health_async(request):
    return {"ok": True}


# --- a router and an operation throttled, one operation left to QuotaMiddleware ----------------

parts = DocumentedAPI(urls_namespace="ninja-parts")
add_refusal_handler(parts)
router = Router(throttle=QuotaThrottle())


@router.get("/routed", auth=UserKey())
def routed(request):
    return {"user": request.auth.username}


parts.add_router("/router", router)


@parts.get("/operation", auth=UserKey(), throttle=QuotaThrottle())
def throttled_operation(request):
    return {"user": request.auth.username}


@parts.get("/middleware", auth=UserKey())
def middleware_decided(request):
    return {"user": request.auth.username}


@parts.get("/exempt", auth=UserKey())
@ratelimit_exempt
def exempt_from_the_middleware(request):
    return {"ok": True}


@parts.get("/exempt-throttled", auth=UserKey(), throttle=QuotaThrottle())
@ratelimit_exempt
def exempt_from_the_throttle(request):
    return {"ok": True}
