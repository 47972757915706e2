from django.urls import path

from jobs import views

app_name = "jobs"
urlpatterns = [
    path("jobs/", views.job_list, name="list"),
    path("clusters/<int:cluster_id>/jobs/new/", views.job_new, name="new"),
    path("clusters/<int:cluster_id>/jobs/<int:pk>/", views.job_detail, name="detail"),
    path("clusters/<int:cluster_id>/jobs/<int:pk>/log.txt", views.job_log_download, name="log"),
    path("clusters/<int:cluster_id>/jobs/<int:pk>/stop/", views.job_stop, name="stop"),
]
