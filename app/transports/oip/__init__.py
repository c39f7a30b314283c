from app.transports.oip.routes import router as router
