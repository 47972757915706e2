from voltweb import services


def volt(request):
    """Navigation facts every console page needs: the caller's roles."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"roles": services.roles_for(user)}
