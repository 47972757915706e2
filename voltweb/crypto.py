"""Encryption at rest for secrets Volt must keep (SSH private keys), with settings.VOLT_ENCRYPTION_KEY."""

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


def encrypt(plaintext: str) -> str:
    if not plaintext:
        return ""
    return Fernet(settings.VOLT_ENCRYPTION_KEY.encode()).encrypt(plaintext.encode()).decode()


def decrypt(ciphertext: str) -> str:
    if not ciphertext:
        return ""
    try:
        return Fernet(settings.VOLT_ENCRYPTION_KEY.encode()).decrypt(ciphertext.encode()).decode()
    except InvalidToken:
        raise ValueError(
            "stored secret cannot be decrypted: VOLT_ENCRYPTION_KEY (or SECRET_KEY) changed since it was saved"
        ) from None
