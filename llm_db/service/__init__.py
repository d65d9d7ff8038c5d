"""What a service runs beside the books (the ``worker`` extra): the notice worker
(``llm_db.service.worker``), webhook delivery and verification
(``llm_db.service.notices``) and the Prometheus metrics (``llm_db.service.metrics``).

The core (``import llm_db``, the driver, ``migrate``) imports nothing from here;
``llm_db``'s notice names (``deliver_notices``, ``verify_webhook``, …) load this
folder when first used.
"""
