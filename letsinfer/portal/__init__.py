"""The portal: pages under ``/ui/`` for the people who use the endpoint
(letsinfer.portal.pages), their passwords (letsinfer.portal.passwords) and
sessions. Apart from API keys (letsinfer.authority.apikeys): a password is
not an API key, and nothing here is on the gateway's ``/v1`` path."""
