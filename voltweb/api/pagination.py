from rest_framework.pagination import PageNumberPagination


class VoltPagination(PageNumberPagination):
    """?page=N&page_size=M (up to 500); every collection in the API is paginated."""

    page_size_query_param = "page_size"
    max_page_size = 500
