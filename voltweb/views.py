"""Console pages for accounts: API tokens and teams; and a health endpoint for load balancers."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.db.models import Prefetch
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.debug import sensitive_variables
from django.views.decorators.http import require_POST

from voltweb import services, throttle
from voltweb.domain import DomainError
from voltweb.forms import TeamQuotaForm, TokenForm
from voltweb.models import ApiToken, TeamEvent


class LoginView(auth_views.LoginView):
    """Django's sign-in page, answering 429 with Retry-After while the address, or the account from this
    address, is throttled.

    The counting itself happens in voltweb.authentication.ThrottledModelBackend (every sign-in path).
    """

    template_name = "registration/login.html"

    def post(self, request, *args, **kwargs):
        wait = throttle.login_retry_after(request, request.POST.get("username"))
        if wait:
            response = self.render_to_response(self.get_context_data(throttled_for=wait), status=429)
            response["Retry-After"] = str(wait)
            return response
        return super().post(request, *args, **kwargs)


@login_required
@sensitive_variables("issued", "context")
def tokens(request):
    form = TokenForm(request.POST or None)
    issued = None
    if request.method == "POST" and form.is_valid():
        issued = services.create_api_token(request.user, form.cleaned_data["name"])
        form = TokenForm()
    context = {
        "form": form,
        "issued": issued,
        "tokens": ApiToken.objects.filter(user=request.user),
        "lifetime_days": settings.VOLT_TOKEN_LIFETIME_DAYS,
    }
    return render(request, "voltweb/tokens.html", context)


@login_required
@require_POST
def revoke_token(request, pk):
    token = get_object_or_404(ApiToken, pk=pk, user=request.user)
    services.revoke_api_token(token)
    messages.success(request, f"Token “{token.name}” revoked. Pipelines using it now get 401.")
    return redirect("tokens")


QUOTA_AUDIT_LINES = 5  # the latest quota changes the teams page shows per team


@login_required
def teams(request):
    """The caller's teams (platform admins: all) with members, use against quota and, for platform admins,
    the form that sets it and its latest changes. Use is drawn by the clusters app's `team_quotas` tag."""
    latest = TeamEvent.objects.select_related("actor")[:QUOTA_AUDIT_LINES]
    teams = (
        services.teams_of(request.user)
        .select_related("quota")
        .prefetch_related("memberships__user", Prefetch("events", queryset=latest, to_attr="latest_events"))
    )
    admin = services.is_platform_admin(request.user)
    for team in teams:  # the rows the template (and its quota tag) read again: no query per team
        quota = getattr(team, "quota", None)
        team.quota_form = (
            TeamQuotaForm(initial=TeamQuotaForm.initial_for(quota), prefix=f"q{team.pk}") if admin else None
        )
    return render(request, "voltweb/teams.html", {"teams": teams})


@login_required
@require_POST
def team_quota(request, pk):
    """Set a team's quota from the teams page (platform admins; others: 403, or 404 for a team not theirs)."""
    team = get_object_or_404(services.teams_of(request.user), pk=pk)
    if not services.is_platform_admin(request.user):
        raise PermissionDenied("Only platform admins set team quotas.")
    form = TeamQuotaForm(request.POST, prefix=f"q{team.pk}")
    if not form.is_valid():
        problems = "; ".join(f"{form.fields[f].label}: {' '.join(e)}" for f, e in form.errors.items())
        messages.error(request, f"{team.name}'s quota is unchanged: {problems}")
        return redirect("teams")
    try:
        services.set_team_quota(team, request.user, **form.cleaned_data)
    except DomainError as exc:
        messages.error(request, f"{team.name}'s quota is unchanged: {exc}")
    else:
        messages.success(request, f"{team.name}'s quota saved (recorded in its audit trail).")
    return redirect("teams")


def healthz(request):
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


@csrf_exempt  # a 404 for every method: a session cookie without a CSRF token must not turn it into a 403
def api_not_found(request, *args, **kwargs):
    """Any /api/ URL no route matches: the API's one error shape, whatever the method or credentials."""
    message = "No such API endpoint; see /api/docs/ for the list."
    return JsonResponse({"error": {"code": "not_found", "message": message}}, status=404)
