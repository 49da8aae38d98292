"""Clicks in the console that load a page, waited for until the next page is in place."""

from __future__ import annotations

from typing import Any

from tests.loopback import wait_for


def stale(element: Any) -> bool:
    """Whether the page that held `element` has been replaced (the browser loaded another one, or is
    replacing it: chromedriver then answers "Node with given id does not belong to the document")."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        if "does not belong to the document" in str(exc.msg):
            return True
        raise
    return False


def click_through(driver: Any, by: str, value: str) -> None:
    """Click what (`by`, `value`) finds, a link or a form's button, and wait until the page it loads is in place.

    The click returns once the browser has started on the next page; an element looked up right after can
    still come from the page being left, and using it then fails ("Node with given id does not belong to
    the document"). The old page's root goes stale when the next page replaces it."""
    old = driver.find_element("tag name", "html")
    driver.find_element(by, value).click()
    wait_for(lambda: stale(old), what=f"the page that {value!r} loads")
    wait_for(lambda: driver.execute_script("return document.readyState") == "complete",
             what=f"the page that {value!r} loads to finish")
